"""The EC2 edge: launch, describe, terminate and reconcile the instances of one run.

A narrow provider interface in the manner of Parsl's providers: the controller asks for
``launch(type, count)``, ``describe()``, ``terminate(ids)``, ``reconcile(known_ids)``, and
gets records back (``records.py``); EC2's states and error codes are translated here and
nothing is raised into the controller (failures are :class:`AwsFailure` records).

Safety rules, enforced here rather than trusted to callers:

- every instance (and its root volume) is tagged ``broker:managed=true``,
  ``broker:run=<run_id>``, ``Name=broker-<run_id>-<type>``, ``broker:client-token=<token>``,
  ``broker:offer=<the inventory's key of the type>`` plus the inventory's extra tags;

Markets. The type a launch names is the inventory's key: an EC2 type (``c5.xlarge``,
on-demand) or its spot offer (``c5.xlarge@spot``, :func:`broker.core.model.spot_key`).
RunInstances is asked for the EC2 type; a spot offer adds ``InstanceMarketOptions``
(one-time, terminated on interruption, ``MaxPrice`` when the inventory caps it). Describe
maps each instance back to its key through the ``broker:offer`` tag (EC2's InstanceType
says nothing of the market), and keeps EC2's ``StateReason`` code: a spot instance EC2 took
back ends ``terminated`` with ``Server.SpotInstanceTermination``
(:attr:`InstanceRecord.interrupted`).
- a launch is idempotent in its client token: EC2 honours ``ClientToken`` itself, and before
  every attempt the fleet also looks for instances already tagged with the token (moto, and
  EC2 after a lost response to a call it did carry out), so a retry or a replay after a
  crash returns the same instances instead of creating more;
- only THROTTLED and TIMEOUT failures are retried (``retry.py``), with the same token;
- only instances carrying this run's ``broker:run`` tag are ever terminated; others are
  refused without a TerminateInstances call.

Instance IPs are recorded for information only; nothing in this module contacts them.
"""

from __future__ import annotations

import base64
import math
import random
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping, TypeVar

import structlog
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, WaiterError

from broker.config.aws import AwsSettings

from .errors import RETRYABLE, classify, kind_of_code
from .records import (
    AwsFailure,
    CredentialCheck,
    DescribeOutcome,
    InstanceRecord,
    InstanceState,
    LaunchErrorKind,
    LaunchOutcome,
    Reconciliation,
    TerminateOutcome,
    WaitOutcome,
)
from .retry import RetryPolicy

MANAGED_TAG = "broker:managed"
RUN_TAG = "broker:run"
TOKEN_TAG = "broker:client-token"
OFFER_TAG = "broker:offer"
SPOT_SUFFIX = "@spot"  # broker.core.model.spot_key

# EC2 accepts client tokens of up to 64 ASCII characters.
_MAX_TOKEN_LEN = 64
# Tag values are limited to 256 characters; the Name tag adds a prefix and the type.
_MAX_RUN_ID_LEN = 128

T = TypeVar("T")


def _client_config() -> Config:
    """One attempt per boto3 call: retries are ours, with the client token kept across them."""
    return Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60)


class Ec2Fleet:
    """The instances of one run on EC2.

    ``session_or_client`` is a ``boto3.Session`` (the fleet makes its EC2 and STS clients,
    with botocore's own retries switched off so that ours are the only ones) or a ready EC2
    client (the dry-run's moto client, or a client with faults attached, ``faults.py``).
    ``clock``, ``sleep`` and ``rng`` are injected so tests neither wait nor depend on luck.
    """

    def __init__(
        self,
        session_or_client: Any,
        settings: AwsSettings,
        run_id: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        retry: RetryPolicy = RetryPolicy(),
        endpoint_url: str | None = None,
        sts_client: Any = None,
    ) -> None:
        if not run_id or len(run_id) > _MAX_RUN_ID_LEN:
            raise ValueError(f"run_id must have 1 to {_MAX_RUN_ID_LEN} characters, got {run_id!r}")
        self.settings = settings
        self.run_id = run_id
        self._clock = clock
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._retry = retry
        if hasattr(session_or_client, "run_instances"):
            self._ec2 = session_or_client
            self._sts = sts_client
        else:
            session = session_or_client
            self._ec2 = session.client(
                "ec2", region_name=settings.region, endpoint_url=endpoint_url, config=_client_config()
            )
            self._sts = sts_client or session.client(
                "sts", region_name=settings.region, endpoint_url=endpoint_url, config=_client_config()
            )
        self._log = structlog.get_logger().bind(run_id=run_id)

    # -- launching -----------------------------------------------------------------------
    def launch(
        self, type_name: str, count: int, *, client_token: str, user_data: str | None = None,
        max_price_per_hour: float | None = None,
    ) -> LaunchOutcome:
        """Launch ``count`` instances of ``type_name`` at once, idempotently in ``client_token``.

        Returns the instances that exist under the token. A failure is a record, never an
        exception: CAPACITY/LIMIT/INVALID/AUTH at once, THROTTLED/TIMEOUT once retries are
        spent, PARTIAL with the instances that did launch when EC2 gave fewer than asked.
        ``type_name`` is the inventory's key (``c5.xlarge@spot`` launches ``c5.xlarge`` on the
        spot market, capped at ``max_price_per_hour`` if given).
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if not client_token or len(client_token) > _MAX_TOKEN_LEN or not client_token.isascii():
            raise ValueError(f"client_token must be 1 to {_MAX_TOKEN_LEN} ASCII characters")

        def outcome(**fields: Any) -> LaunchOutcome:
            return LaunchOutcome(type_name=type_name, requested=count, client_token=client_token, **fields)

        if not self.settings.ami:
            return outcome(failure=AwsFailure(LaunchErrorKind.INVALID, "", "no AMI configured (aws.ami)"))
        params = self._run_params(type_name, count, client_token, user_data, max_price_per_hour)
        token_filter = {"Name": f"tag:{TOKEN_TAG}", "Values": [client_token]}

        def attempt() -> tuple[tuple[InstanceRecord, ...], bool]:
            existing = self._describe_where([token_filter])
            if existing:
                return tuple(existing), True
            response = self._ec2.run_instances(**params)
            return tuple(_record(i) for i in response["Instances"]), False

        result, attempts = self._retrying("run_instances", attempt)
        # "token" in a log key would be masked by the redact processor; the idempotency key is no secret.
        log = self._log.bind(type=type_name, requested=count, idempotency_key=client_token, attempts=attempts)
        if isinstance(result, AwsFailure):
            log.warning("aws.run_instances_failed", kind=result.kind.value, code=result.code, error=result.message)
            return outcome(failure=result, attempts=attempts)
        instances, reused = result
        other_types = sorted({i.type_name for i in instances} - {type_name})
        if other_types:
            failure = AwsFailure(
                LaunchErrorKind.INVALID,
                "IdempotentParameterMismatch",
                f"client token {client_token!r} already launched {', '.join(other_types)}, not {type_name}",
            )
            log.warning("aws.run_instances_failed", kind=failure.kind.value, code=failure.code, error=failure.message)
            return outcome(failure=failure, attempts=attempts, reused=reused)
        ids = [i.id for i in instances]
        if len(instances) < count:
            failure = AwsFailure(
                LaunchErrorKind.PARTIAL, "", f"asked for {count} {type_name}, EC2 launched {len(instances)}"
            )
            log.warning("aws.run_instances_partial", launched=len(instances), instance_ids=ids)
            return outcome(instances=instances, failure=failure, attempts=attempts, reused=reused)
        log.info("aws.run_instances", launched=len(instances), instance_ids=ids, reused=reused)
        return outcome(instances=instances, attempts=attempts, reused=reused)

    def _run_params(self, type_name: str, count: int, client_token: str, user_data: str | None,
                    max_price_per_hour: float | None = None) -> dict[str, Any]:
        s = self.settings
        ec2_type, spot = offer_of(type_name)
        tags = {
            **dict(s.tags),
            MANAGED_TAG: "true",
            RUN_TAG: self.run_id,
            TOKEN_TAG: client_token,
            OFFER_TAG: type_name,
            "Name": f"broker-{self.run_id}-{type_name}",
        }
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        params: dict[str, Any] = {
            "ImageId": s.ami,
            "InstanceType": ec2_type,
            "MinCount": count,  # EC2 launches all or nothing when MinCount = MaxCount
            "MaxCount": count,
            "ClientToken": client_token,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
        }
        if spot:
            options: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if max_price_per_hour is not None:
                options["MaxPrice"] = f"{max_price_per_hour:.6f}".rstrip("0").rstrip(".")
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        if s.key_name:
            params["KeyName"] = s.key_name
        if s.security_group:
            params["SecurityGroupIds"] = [s.security_group]
        if s.subnet:
            params["SubnetId"] = s.subnet
        if s.instance_profile:
            key = "Arn" if s.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: s.instance_profile}
        if user_data is None:
            user_data = s.user_data  # the inventory's aws.user_data, if any
        if user_data is not None:
            params["UserData"] = user_data  # boto3 base64-encodes it
        return params

    # -- observing -----------------------------------------------------------------------
    def describe(self) -> DescribeOutcome:
        """Every instance tagged with this run, in any state; or the failure that hid them."""
        result, _ = self._retrying("describe_instances", lambda: self._describe_where([]))
        if isinstance(result, AwsFailure):
            self._log.warning("aws.describe_failed", kind=result.kind.value, code=result.code)
            return DescribeOutcome(failure=result)
        return DescribeOutcome(instances=tuple(result))

    def reconcile(self, known_ids: Iterable[str]) -> Reconciliation:
        """Compare the journal's instance ids with EC2 (see :class:`Reconciliation`).

        Reads only; it never starts or stops anything. Instances without this run's tag are
        looked up only by the ids the journal names, to tell strays from missing ones.
        """
        known = list(dict.fromkeys(known_ids))
        described = self.describe()
        if described.failure is not None:
            return Reconciliation(failure=described.failure)
        ours = described.instances
        by_id = {r.id: r for r in ours}
        known_set = set(known)
        adopted = tuple(r for r in ours if r.id not in known_set)
        unseen = [i for i in known if i not in by_id]
        found: list[InstanceRecord] = []
        if unseen:
            id_filter = {"Name": "instance-id", "Values": unseen}
            result, _ = self._retrying("describe_instances", lambda: self._describe_where([id_filter], ours_only=False))
            if isinstance(result, AwsFailure):
                return Reconciliation(failure=result)
            found = result
        strays = tuple(r.id for r in found if not r.state.gone)
        stray_set = set(strays)
        missing = tuple(
            i for i in known if (i in by_id and by_id[i].state.gone) or (i not in by_id and i not in stray_set)
        )
        result_rec = Reconciliation(adopted=adopted, missing=missing, strays=strays)
        self._log.info(
            "aws.reconciled",
            adopted=[r.id for r in adopted],
            missing=list(missing),
            strays=list(strays),
        )
        return result_rec

    def wait_running(self, instance_ids: Iterable[str], timeout_s: float, *, poll_s: float = 5.0) -> WaitOutcome:
        """Wait (boto3's ``instance_running`` waiter) until this run's ``instance_ids`` run.

        Polls every ``poll_s`` (at least 1 s) at most ``ceil(timeout_s / poll_s)`` times, then
        reports which instances run and which do not. Ids without this run's tag never run
        as far as this method is concerned.
        """
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return WaitOutcome()
        delay_s = max(1, int(poll_s))
        max_attempts = max(1, math.ceil(timeout_s / delay_s))
        filters = self._run_filters([{"Name": "instance-id", "Values": ids}])
        failure: AwsFailure | None = None
        try:
            self._ec2.get_waiter("instance_running").wait(
                Filters=filters, WaiterConfig={"Delay": delay_s, "MaxAttempts": max_attempts}
            )
        except WaiterError as exc:
            failure = _waiter_failure(exc, timeout_s)
        except (ClientError, BotoCoreError) as exc:
            failure = classify(exc)
        result, _ = self._retrying(
            "describe_instances", lambda: self._describe_where([{"Name": "instance-id", "Values": ids}])
        )
        if isinstance(result, AwsFailure):
            return WaitOutcome(not_running=tuple(ids), failure=failure or result)
        running = tuple(r for r in result if r.state is InstanceState.RUNNING)
        running_ids = {r.id for r in running}
        return WaitOutcome(
            running=running, not_running=tuple(i for i in ids if i not in running_ids), failure=failure
        )

    def address_of(self, instance_id: str, which: str = "public") -> str | None:
        """The ``public`` or ``private`` IP of one of this run's instances, ``None`` if it has
        none (yet), is not this run's, or EC2 could not be asked (the caller retries).

        The broker itself never contacts the address in a dry run: moto's IPs are invented.
        """
        if which not in ("public", "private"):
            raise ValueError(f"which must be 'public' or 'private', got {which!r}")
        record = self._own_live_record(instance_id)
        if record is None:
            return None
        return record.public_ip if which == "public" else record.private_ip

    def _own_live_record(self, instance_id: str) -> InstanceRecord | None:
        result, _ = self._retrying(
            "describe_instances",
            lambda: self._describe_where([{"Name": "instance-id", "Values": [instance_id]}]),
        )
        if isinstance(result, AwsFailure):
            self._log.warning("aws.describe_failed", kind=result.kind.value, code=result.code)
            return None
        return next((r for r in result if r.id == instance_id and not r.state.gone), None)

    def console_output(self, instance_id: str) -> str | None:
        """The instance's console text (where cloud-init prints its SSH host keys), or ``None``
        when EC2 has none yet or the call failed. Only this run's instances are asked about."""
        if self._own_live_record(instance_id) is None:
            return None
        result, _ = self._retrying(
            "get_console_output", lambda: self._ec2.get_console_output(InstanceId=instance_id, Latest=True)
        )
        if isinstance(result, AwsFailure):
            self._log.warning("aws.console_output_failed", instance_id=instance_id, kind=result.kind.value,
                              code=result.code)
            return None
        output = result.get("Output")
        if not output:
            return None
        try:
            return base64.b64decode(output).decode("utf-8", "replace")
        except (ValueError, TypeError):
            return output  # some clients hand the text back decoded already

    # -- terminating ---------------------------------------------------------------------
    def terminate(self, instance_ids: Iterable[str]) -> TerminateOutcome:
        """Terminate the given instances that carry this run's tag; refuse the others.

        The run's instances are described first; an id not among them is refused and never
        reaches TerminateInstances. Instances already shutting down or terminated are
        reported as such without a call, so terminating twice is harmless.
        """
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return TerminateOutcome()
        described = self.describe()
        if described.failure is not None:
            return TerminateOutcome(failed=tuple(ids), failure=described.failure)
        by_id = {r.id: r for r in described.instances}
        refused = tuple(i for i in ids if i not in by_id)
        already = tuple(i for i in ids if i in by_id and by_id[i].state.gone)
        to_stop = [i for i in ids if i in by_id and not by_id[i].state.gone]
        if refused:
            self._log.warning("aws.terminate_refused", instance_ids=list(refused), reason="no run tag")
        if not to_stop:
            return TerminateOutcome(already_terminated=already, refused=refused)
        result, attempts = self._retrying(
            "terminate_instances", lambda: self._ec2.terminate_instances(InstanceIds=to_stop)
        )
        if isinstance(result, AwsFailure):
            self._log.warning(
                "aws.terminate_failed", instance_ids=to_stop, kind=result.kind.value, code=result.code
            )
            return TerminateOutcome(already_terminated=already, refused=refused, failed=tuple(to_stop), failure=result)
        self._log.info("aws.terminate_instances", instance_ids=to_stop, attempts=attempts)
        return TerminateOutcome(terminated=tuple(to_stop), already_terminated=already, refused=refused)

    # -- pre-flight checks -----------------------------------------------------------------
    def check_credentials(self) -> CredentialCheck:
        """Whether AWS accepts the configured credentials (STS GetCallerIdentity).

        Without an STS client (a bare EC2 client was given) a signed DescribeInstances on the
        run's tag proves the same thing. The message says what to fix; it never shows keys.
        """
        try:
            if self._sts is not None:
                identity = self._sts.get_caller_identity()
                arn = identity.get("Arn")
                return CredentialCheck(True, f"AWS credentials work (identity {arn})", arn)
            self._ec2.describe_instances(Filters=self._run_filters([]), MaxResults=5)
            return CredentialCheck(True, "AWS credentials work (EC2 DescribeInstances accepted)")
        except (ClientError, BotoCoreError) as exc:
            failure = classify(exc)
        if failure.kind is LaunchErrorKind.AUTH and failure.code in ("NoCredentialsError", "PartialCredentialsError"):
            message = failure.message
        elif failure.kind is LaunchErrorKind.AUTH:
            message = f"AWS rejected the credentials ({failure.code}): {failure.message}"
        else:
            message = f"could not check the AWS credentials ({failure.code}): {failure.message}"
        return CredentialCheck(False, message)

    # -- plumbing --------------------------------------------------------------------------
    def _run_filters(self, extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"Name": f"tag:{RUN_TAG}", "Values": [self.run_id]}, *extra]

    def _describe_where(self, extra: list[dict[str, Any]], *, ours_only: bool = True) -> list[InstanceRecord]:
        """All pages of DescribeInstances under this run's tag (and ``extra`` filters)."""
        kwargs: dict[str, Any] = {"Filters": self._run_filters(extra) if ours_only else extra}
        records: list[InstanceRecord] = []
        while True:
            page = self._ec2.describe_instances(**kwargs)
            records.extend(_record(i) for r in page["Reservations"] for i in r["Instances"])
            if not page.get("NextToken"):
                return records
            kwargs["NextToken"] = page["NextToken"]

    def _retrying(self, operation: str, call: Callable[[], T]) -> tuple[T | AwsFailure, int]:
        """Run ``call`` until it succeeds, fails for good, or the retry policy is spent.

        Returns the result or the last failure, and the number of attempts made.
        """
        policy = self._retry
        started_s = self._clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return call(), attempt
            except (ClientError, BotoCoreError) as exc:
                failure = classify(exc)
            if failure.kind not in RETRYABLE or attempt >= policy.max_attempts:
                return failure, attempt
            delay_s = policy.delay_s(attempt, self._rng)
            if self._clock() - started_s + delay_s > policy.max_total_s:
                return failure, attempt
            self._log.info("aws.retry", operation=operation, attempt=attempt, code=failure.code, delay_s=round(delay_s, 3))
            self._sleep(delay_s)


def offer_of(type_name: str) -> tuple[str, bool]:
    """``(EC2 instance type, spot?)`` of an inventory key: ``c5.xlarge@spot`` -> ``(c5.xlarge, True)``."""
    if type_name.endswith(SPOT_SUFFIX):
        return type_name[: -len(SPOT_SUFFIX)], True
    return type_name, False


def _record(instance: Mapping[str, Any]) -> InstanceRecord:
    launched = instance["LaunchTime"]
    if isinstance(launched, datetime) and launched.tzinfo is None:
        launched = launched.replace(tzinfo=timezone.utc)
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    return InstanceRecord(
        id=instance["InstanceId"],
        type_name=tags.get(OFFER_TAG) or instance["InstanceType"],
        state=InstanceState.from_vendor(instance.get("State", {}).get("Name")),
        launched_at_s=launched.timestamp(),
        private_ip=instance.get("PrivateIpAddress"),
        public_ip=instance.get("PublicIpAddress"),
        tags=tags,
        state_reason=(instance.get("StateReason") or {}).get("Code") or None,
    )


def _waiter_failure(exc: WaiterError, timeout_s: float) -> AwsFailure:
    last = exc.last_response or {}
    if "Error" in last:
        code = str(last["Error"].get("Code") or "WaiterError")
        return AwsFailure(kind_of_code(code), code, str(last["Error"].get("Message") or exc))
    if "Max attempts exceeded" in str(exc):
        return AwsFailure(LaunchErrorKind.TIMEOUT, "WaiterTimeout", f"not all instances running after {timeout_s:g}s")
    return AwsFailure(LaunchErrorKind.UNKNOWN, "WaiterError", f"an instance will not run: {exc}")
