"""Imported once by bench_crash's fork server, so that each ``broker run`` it forks starts
warm: the broker's modules, boto3 with its EC2 model loaded, pulp, APScheduler. Nothing
here starts a thread (forking a threaded process is unsafe)."""

import os

import apscheduler.schedulers.background  # noqa: F401
import boto3
import structlog  # noqa: F401

import broker.cli  # noqa: F401
import broker.cli.down  # noqa: F401
import broker.cli.run  # noqa: F401
import broker.core.plan  # noqa: F401
import broker.shells.aws  # noqa: F401
import broker.shells.crashpoints  # noqa: F401
import broker.shells.run  # noqa: F401
import broker.shells.journal  # noqa: F401
import broker.shells.moto_world  # noqa: F401
import broker.shells.nodes  # noqa: F401

# The default session's loader caches the EC2 service model for every forked run.
boto3.setup_default_session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
boto3.client("ec2", region_name="us-east-1", endpoint_url="http://127.0.0.1:9")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
