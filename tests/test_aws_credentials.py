"""Credential checks: missing credentials are an AUTH record, rejected ones a clear message.

No test here has moto running: requests that would leave are aimed at 127.0.0.1:9 (nothing
listens) and a ``before-send`` hook fails the test if one is about to be sent at all.
"""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from broker.config.aws import AwsSettings
from broker.shells.aws import Ec2Fleet, LaunchErrorKind
from test_aws_fleet import REGION, isolate_from_real_aws


def test_missing_credentials_are_an_auth_record_and_no_request_leaves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    isolate_from_real_aws(monkeypatch, tmp_path)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    sent: list[str] = []

    def refuse_to_send(request, **_):  # would only run if a signed request were about to leave
        sent.append(request.url)
        raise AssertionError(f"a request was about to be sent to {request.url}")

    session = boto3.Session(region_name=REGION)
    session.events.register("before-send", refuse_to_send)
    settings = AwsSettings(region=REGION, ami="ami-12345678")
    fleet = Ec2Fleet(session, settings, "run-nocreds", endpoint_url="http://127.0.0.1:9", sleep=_no_sleep)

    outcome = fleet.launch("t3.micro", 1, client_token="tok-nocreds")
    check = fleet.check_credentials()

    assert outcome.failure is not None and outcome.failure.kind is LaunchErrorKind.AUTH
    assert outcome.attempts == 1
    assert "AWS_ACCESS_KEY_ID" in outcome.failure.message
    assert not check.ok and "no AWS credentials" in check.message
    assert sent == []


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"slept {seconds}s: an AUTH failure must not be retried")


def test_rejected_credentials_give_a_clear_message_without_the_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    isolate_from_real_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREJECTEDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rejected-secret-example")
    session = boto3.Session(region_name=REGION)
    sts = session.client("sts", endpoint_url="http://127.0.0.1:9")
    stubber = Stubber(sts)
    stubber.add_client_error(
        "get_caller_identity",
        service_error_code="InvalidClientTokenId",
        service_message="The security token included in the request is invalid.",
        http_status_code=403,
    )
    ec2 = session.client("ec2", endpoint_url="http://127.0.0.1:9")
    fleet = Ec2Fleet(ec2, AwsSettings(region=REGION), "run-rejected", sts_client=sts)
    with stubber:
        check = fleet.check_credentials()
    assert not check.ok
    assert "rejected" in check.message and "InvalidClientTokenId" in check.message
    assert "AKIAREJECTEDEXAMPLE" not in check.message and "rejected-secret" not in check.message
