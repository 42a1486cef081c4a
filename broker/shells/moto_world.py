"""The dry run's AWS: moto, with fake credentials that can never reach an account.

Two ways to serve it:

- :func:`dry_run_ec2` (what ``broker run --dry-run`` uses): a detached moto server process
  per run directory, on 127.0.0.1 and a port the system picks, so that the run's EC2 state
  outlives a killed daemon. The first ``broker run --dry-run`` starts it
  (``python -m broker.shells.moto_world serve RUN_DIR``); it holds ``RUN_DIR/moto.lock``
  (flock) while alive and writes ``RUN_DIR/moto.json`` (pid, port, and the ids of the world
  it serves). A resumed run and ``broker down`` reach it through that file;
  :func:`stop_moto_server` ends it (the run's end, ``broker down``). Its output goes to
  ``RUN_DIR/moto.log``.
- :func:`mock_ec2`: moto in-process (it dies with the process), for tests.

:func:`mock_ec2` sets ``AWS_ACCESS_KEY_ID=testing`` (and the secret, session token, region,
``AWS_EC2_METADATA_DISABLED=true``) *before* boto3 is used, starts moto's ``mock_aws``, and
creates what a launch needs to look real: a VPC, a subnet, a security group, a key pair and
an AMI. The inventory's ``aws`` section cannot name these (moto makes up its own ids), so
the settings handed back keep the inventory's region and tags and point at the created ones.
Everything is undone on exit, environment included. The instance addresses moto reports are
fake and never contacted: the dry-run shell realizes each instance as a local agent.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from broker.config.aws import AwsSettings

DEFAULT_REGION = "us-east-1"
SERVER_FILE = "moto.json"
SERVER_LOCK = "moto.lock"
SERVER_LOG = "moto.log"
SERVER_START_TIMEOUT_S = 20.0
_WORLD_FIELDS = ("region", "ami", "key_name", "security_group", "subnet")
_WORLD_CIDR, _SUBNET_CIDR = "10.77.0.0/16", "10.77.1.0/24"
_FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Files a real account's credentials could come from: pointed at nothing during the dry run.
_MASKED_FILES = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
# An endpoint override (LocalStack users set one) would send moto's requests past moto.
_UNSET = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_STS")


@contextmanager
def fake_aws_environment(region: str) -> Iterator[None]:
    """Fake credentials and region in ``os.environ`` for the block; the old values after."""
    saved = {k: os.environ.get(k) for k in (*_FAKE_ENV, *_MASKED_FILES, "AWS_DEFAULT_REGION", *_UNSET)}
    os.environ.update(_FAKE_ENV)
    os.environ["AWS_DEFAULT_REGION"] = region
    for name in _UNSET:
        os.environ.pop(name, None)
    for name in _MASKED_FILES:
        os.environ[name] = os.devnull
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def mock_ec2(settings: AwsSettings, run_id: str) -> Iterator[tuple[Any, AwsSettings]]:
    """An EC2 client served by moto and the settings to launch with inside it."""
    region = settings.region or DEFAULT_REGION
    with fake_aws_environment(region):
        import boto3
        from moto import mock_aws

        with mock_aws():
            ec2 = boto3.client("ec2", region_name=region)
            yield ec2, _create_world(ec2, settings, region, run_id)


def _create_world(ec2: Any, settings: AwsSettings, region: str, run_id: str) -> AwsSettings:
    """What a launch needs (VPC, subnet, security group, key pair, AMI), each found if an
    earlier attempt made it already: a ``broker run`` killed half-way through this leaves a
    server holding part of a world, and the next one must finish it, not trip over it
    (``InvalidKeyPair.Duplicate``)."""
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "cidr", "Values": [_WORLD_CIDR]}])["Vpcs"]
    vpc_id = vpcs[0]["VpcId"] if vpcs else ec2.create_vpc(CidrBlock=_WORLD_CIDR)["Vpc"]["VpcId"]
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc_id]},
                                            {"Name": "cidr-block", "Values": [_SUBNET_CIDR]}])["Subnets"]
    subnet_id = (subnets[0]["SubnetId"] if subnets
                 else ec2.create_subnet(VpcId=vpc_id, CidrBlock=_SUBNET_CIDR)["Subnet"]["SubnetId"])
    group_name = f"broker-dry-run-{run_id}"
    groups = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [group_name]},
                                                   {"Name": "vpc-id", "Values": [vpc_id]}])["SecurityGroups"]
    group_id = (groups[0]["GroupId"] if groups else
                ec2.create_security_group(GroupName=group_name, Description="broker dry run", VpcId=vpc_id)["GroupId"])
    key_name = settings.key_name or "broker-dry-run"
    if not ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [key_name]}])["KeyPairs"]:
        ec2.create_key_pair(KeyName=key_name)
    # An AMI of our own: listing moto's catalogue of public ones takes a second.
    image_name = f"broker-dry-run-{run_id}"
    images = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [image_name]}])["Images"]
    ami = images[0]["ImageId"] if images else ec2.register_image(Name=image_name, RootDeviceName="/dev/xvda")["ImageId"]
    return replace(
        settings,
        region=region,
        ami=ami,
        key_name=key_name,
        security_group=group_id,
        subnet=subnet_id,
        instance_profile=None,
    )


# -- the per-run moto server ------------------------------------------------------------------
class MotoServerError(RuntimeError):
    """The dry run's moto server could not be started or reached; the message says why."""


@dataclass(frozen=True, slots=True)
class MotoServer:
    """A live moto server serving one run directory."""

    pid: int
    port: int
    world: dict[str, Any] | None  # the ids _create_world made, once made

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _read_server_file(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / SERVER_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_server_file(run_dir: Path, data: dict[str, Any]) -> None:
    tmp = run_dir / (SERVER_FILE + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, run_dir / SERVER_FILE)


def _lock_held(run_dir: Path) -> bool:
    """Whether a server process holds the run directory's moto lock (so it is alive)."""
    try:
        fd = os.open(run_dir / SERVER_LOCK, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def find_moto_server(run_dir: str | Path) -> MotoServer | None:
    """The live moto server of ``run_dir``, or None. Its file is believed only while its
    lock is held, so a stale file left by a killed server is never trusted."""
    run_dir = Path(run_dir)
    if not _lock_held(run_dir):
        return None
    data = _read_server_file(run_dir)
    if data is None or not isinstance(data.get("port"), int) or not isinstance(data.get("pid"), int):
        return None
    return MotoServer(data["pid"], data["port"], data.get("world"))


def spawn_moto_server(run_dir: str | Path, region: str = DEFAULT_REGION) -> subprocess.Popen | None:
    """Start the detached moto server for ``run_dir`` without waiting for it (it loads its
    EC2 backend for ``region`` first, which takes a second or two: start it early). None
    when one already serves the directory."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if find_moto_server(run_dir) is not None:
        return None
    with open(run_dir / SERVER_LOG, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "broker.shells.moto_world", "serve", str(run_dir), region],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, **_FAKE_ENV},
        )


def start_moto_server(run_dir: str | Path, timeout_s: float = SERVER_START_TIMEOUT_S, *,
                      region: str = DEFAULT_REGION, process: subprocess.Popen | None = None) -> MotoServer:
    """The moto server serving ``run_dir``: the one already there, the ``process`` given
    (from :func:`spawn_moto_server`) once it is up, or a new one."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    found = find_moto_server(run_dir)
    if found is not None and (process is None or found.pid == process.pid or process.poll() is not None):
        return found
    if process is None:
        process = spawn_moto_server(run_dir, region)
        if process is None:
            return start_moto_server(run_dir, timeout_s, region=region)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = find_moto_server(run_dir)
        if found is not None and found.pid == process.pid:
            return found
        if process.poll() is not None:
            found = find_moto_server(run_dir)  # another process won the race to serve it
            if found is not None:
                return found
            raise MotoServerError(f"the dry run's moto server for {run_dir} exited at once "
                                  f"(status {process.returncode}); see {run_dir / SERVER_LOG}")
        time.sleep(0.02)
    process.kill()
    raise MotoServerError(f"the dry run's moto server for {run_dir} did not start within {timeout_s:g} s; "
                          f"see {run_dir / SERVER_LOG}")


def stop_moto_server(run_dir: str | Path, timeout_s: float = 10.0) -> bool:
    """Stop the moto server of ``run_dir`` (SIGTERM, SIGKILL if slow). True if one was running."""
    run_dir = Path(run_dir)
    found = find_moto_server(run_dir)
    if found is None:
        return False
    try:
        os.kill(found.pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _lock_held(run_dir):
            return True
        time.sleep(0.02)
    try:
        os.kill(found.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def server_client(server: MotoServer, region: str) -> Any:
    """A boto3 EC2 client for the server (call inside :func:`fake_aws_environment`)."""
    import boto3

    from broker.shells.aws.fleet import _client_config

    return boto3.client("ec2", region_name=region, endpoint_url=server.url, config=_client_config(),
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        aws_session_token="testing")


@contextmanager
def dry_run_ec2(settings: AwsSettings, run_id: str, run_dir: str | Path,
                process: subprocess.Popen | None = None) -> Iterator[tuple[Any, AwsSettings, MotoServer]]:
    """An EC2 client served by the run directory's moto server (``process`` if it was
    spawned early, else started now unless one runs), the settings to launch with, and the
    server. A server that already serves a world (a resumed run) is reused as it is: the
    instances it holds are the run's."""
    run_dir = Path(run_dir)
    region = settings.region or DEFAULT_REGION
    with fake_aws_environment(region):
        server = start_moto_server(run_dir, region=region, process=process)
        ec2 = server_client(server, region)
        if server.world is not None and server.world.get("region") == region:
            world = replace(settings, instance_profile=None,
                            **{k: server.world.get(k) for k in _WORLD_FIELDS})
        else:
            world = _create_world(ec2, settings, region, run_id)
            data = _read_server_file(run_dir) or {}
            data["world"] = {k: getattr(world, k) for k in _WORLD_FIELDS}
            _write_server_file(run_dir, data)
            server = replace(server, world=data["world"])
        yield ec2, world, server


def _serve(run_dir: Path, region: str) -> int:
    """The server process: hold the lock, load the EC2 backend, serve on 127.0.0.1, and
    exit at once on SIGTERM/SIGINT (a dry run's EC2 holds nothing worth a clean exit)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / SERVER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"a moto server already serves {run_dir}", file=sys.stderr)
        return 3
    import logging

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    ec2_backends[DEFAULT_ACCOUNT_ID][region]  # load it now rather than on the first call
    server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    _write_server_file(run_dir, {"pid": os.getpid(), "port": port})
    print(f"moto server for {run_dir} on 127.0.0.1:{port}, pid {os.getpid()}", file=sys.stderr, flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while not stop.wait(3600):
        pass
    try:
        (run_dir / SERVER_FILE).unlink()
    except FileNotFoundError:
        pass
    os._exit(0)  # the lock goes with the process


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "serve":
        print("usage: python -m broker.shells.moto_world serve RUN_DIR [REGION]", file=sys.stderr)
        sys.exit(2)
    sys.exit(_serve(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) == 4 else DEFAULT_REGION))
