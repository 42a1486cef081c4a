"""``broker validate``: exit status, summary on stdout, every problem on stderr."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _at_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_valid_inventory_and_bag_print_a_summary_and_exit_0(capsys):
    assert main(["validate", "inventory.yaml", "examples/sweep.yaml"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "inventory.yaml: 1 private node (2 slots), 4 EC2 types (up to 40 instances), hourly billing",
        "examples/sweep.yaml: bag 'sweep', 40 tasks, timeout 30s, 2 retries",
        "valid (add --live to check what a real run needs); nothing was started",
    ]
    assert "problem" not in err


@pytest.mark.parametrize(
    ("inventory", "bag", "summary"),
    [
        ("examples/thesis-catalogue.yaml", "examples/csv.yaml", "1 private node (1 slot), 4 EC2 types (up to 80 instances)"),
        ("examples/per-second.yaml", "examples/commands.yaml", "21 EC2 types (up to 315 instances), per-second billing"),
    ],
)
def test_every_example_pair_validates(capsys, inventory, bag, summary):
    assert main(["validate", inventory, bag]) == 0
    out = capsys.readouterr().out
    assert f"{inventory}: {summary}" in out and f"{bag}: bag '" in out


def test_inventory_alone_is_enough(capsys):
    assert main(["validate", "examples/per-second.yaml"]) == 0
    assert capsys.readouterr().out.count("\n") == 2


def test_problems_of_both_files_go_to_stderr_with_exit_2(tmp_path, capsys):
    (tmp_path / "inv.yaml").write_text("private:\n  - {name: n, local: true, slots: 0}\n")
    (tmp_path / "bag.yaml").write_text("command: 'run {x}'\nsweep: {x: [1]}\ntimeout: 0\n")
    assert main(["validate", str(tmp_path / "inv.yaml"), str(tmp_path / "bag.yaml")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "2 problems found; nothing was started:",
        f"  {tmp_path / 'inv.yaml'}:2: private[0].slots: expected an integer >= 1, got 0",
        f"  {tmp_path / 'bag.yaml'}:3: timeout: must be longer than 0 seconds, got 0",
    ]


def test_live_flag_adds_the_live_checks(tmp_path, capsys):
    key = tmp_path / "id_key"
    key.write_text("not really a key\n")
    os.chmod(key, 0o644)
    (tmp_path / "inv.yaml").write_text(f"private:\n  - {{name: n, host: h.invalid, key: {key}, slots: 1}}\n")
    assert main(["validate", str(tmp_path / "inv.yaml")]) == 0
    assert "add --live" in capsys.readouterr().out
    assert main(["validate", str(tmp_path / "inv.yaml"), "--live"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'inv.yaml'}:2: private[0].key: SSH key {key} is accessible by group or others" in err
    os.chmod(key, 0o600)
    assert main(["validate", str(tmp_path / "inv.yaml"), "--live"]) == 0
    assert "live fields checked" in capsys.readouterr().out


def test_missing_files_are_named(capsys):
    assert main(["validate", "no-such-inventory.yaml", "no-such-bag.yaml"]) == 2
    err = capsys.readouterr().err
    assert "no-such-inventory.yaml: inventory file not found" in err
    assert "no-such-bag.yaml: bag file not found" in err


def test_missing_argument_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate"])
    assert exc.value.code == 2
    assert "INVENTORY" in capsys.readouterr().err


def test_live_asks_aws_and_reports_a_working_account(tmp_path, capsys, monkeypatch):
    """Under moto: a real AMI, key pair and group and offered types pass; the summary names
    the identity and what was found; the quota moto cannot serve is a warning, not a problem."""
    import boto3
    from moto import mock_aws

    from test_aws_fleet import isolate_from_real_aws

    isolate_from_real_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = sorted(i["ImageId"] for i in ec2.describe_images(
            Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"])[0]
        ec2.create_key_pair(KeyName="k")
        group = ec2.create_security_group(GroupName="broker", Description="broker")["GroupId"]
        inventory = tmp_path / "inv.yaml"
        inventory.write_text(
            f"aws:\n  region: us-east-1\n  ami: {ami}\n  key_name: k\n  security_group: {group}\n"
            "  types:\n    - {name: m5.large, slots: 2, speed: 1, price: 0.1, limit: 2}\n"
            "    - {name: c5.xlarge, slots: 4, speed: 1, price: 0.2, limit: 2}\n"
        )
        assert main(["validate", str(inventory), "--live"]) == 0
    out, err = capsys.readouterr()
    checked = out.splitlines()[1]
    assert checked.startswith(f"{inventory}: AWS credentials work (identity arn:aws:")
    for found in ("2 of 2 instance types offered in us-east-1", f"AMI {ami} available", "key pair 'k' found",
                  f"security group '{group}' found"):
        assert found in checked
    assert out.splitlines()[-1] == "valid (live fields checked); nothing was started"
    assert err.startswith("warning: ") and "L-1216C47A" in err


def test_live_with_a_private_only_inventory_asks_nothing_of_aws(tmp_path, capsys, monkeypatch):
    """No EC2 types: no AWS call at all, so no credentials and no network are needed."""
    from test_aws_fleet import isolate_from_real_aws

    isolate_from_real_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("private:\n  - {name: here, local: true, slots: 2}\n")
    assert main(["validate", str(inventory), "--live"]) == 0
    out = capsys.readouterr().out
    assert f"{inventory}: no EC2 types in the inventory: AWS is not needed, nothing was asked of it" in out


def test_live_lists_the_files_problems_and_what_aws_says_at_once(tmp_path, capsys, monkeypatch):
    """A key file that does not exist (the file's problem) and a type not offered (AWS's):
    both in one report, so the user fixes both in one pass."""
    import boto3
    from moto import mock_aws

    from test_aws_fleet import isolate_from_real_aws

    isolate_from_real_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])[
            "Images"][0]["ImageId"]
        ec2.create_key_pair(KeyName="k")
        group = ec2.create_security_group(GroupName="broker", Description="broker")["GroupId"]
        inventory = tmp_path / "inv.yaml"
        inventory.write_text(
            f"aws:\n  region: us-east-1\n  ami: {ami}\n  key_name: k\n  security_group: {group}\n"
            f"  key: {tmp_path / 'no-such-key.pem'}\n"
            "  types:\n    - {name: zz.huge, slots: 2, speed: 1, price: 0.1, limit: 2}\n"
        )
        assert main(["validate", str(inventory), "--live"]) == 2
    err = capsys.readouterr().err
    assert "2 problems found; nothing was started:" in err
    assert "aws.key: SSH key file not found" in err
    assert "aws.types.zz.huge: instance type 'zz.huge' is not offered in us-east-1" in err
