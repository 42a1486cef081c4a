"""The spot interruption notice, read from the EC2 instance metadata (IMDSv2). Stdlib only.

EC2 gives a spot instance two minutes' notice before it takes it back: from then on
``GET /latest/meta-data/spot/instance-action`` answers a JSON document such as
``{"action": "terminate", "time": "2026-11-24T13:08:00Z"}``; before, it answers 404.
IMDSv2 wants a session token first: ``PUT /latest/api/token`` with the header
``X-aws-ec2-metadata-token-ttl-seconds``, its answer sent back as ``X-aws-ec2-metadata-token``
on every read. A token that expired (401) is fetched again.

:class:`SpotWatcher` polls on a thread of its own every ``poll_s`` seconds and calls
``on_notice(action, time_text, in_s)`` once, when it first reads a notice, then stops;
``in_s`` is the time left until ``time_text`` on this machine's clock (0 when passed or
unreadable). The metadata's base URL is a parameter: EC2's own is
``http://169.254.169.254``; tests and the dry run point it at a server on 127.0.0.1.
An endpoint that cannot be reached is logged once and polled again (a notice missed for
one poll is read at the next).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Optional, Tuple

EC2_METADATA_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL_S = 21600  # what the AWS CLI asks for: 6 hours
REQUEST_TIMEOUT_S = 2.0
DEFAULT_POLL_S = 5.0

Notice = Tuple[str, str, float]  # (action, time as the document gives it, seconds left)


def seconds_until(time_text: str, now: Optional[float] = None) -> float:
    """Seconds from ``now`` (epoch, default the clock) to an ISO 8601 UTC time; 0 when the
    time has passed or cannot be read (the notice then means: at once)."""
    text = time_text.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


class MetadataClient:
    """Reads the instance-action document over IMDSv2 from ``base_url``."""

    def __init__(self, base_url: str = EC2_METADATA_URL, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token: Optional[str] = None
        self._token_until = 0.0
        # The metadata service is on the link (or loopback): never through an HTTP proxy.
        import urllib.request  # here, not at the top: every agent imports this module, few are on spot

        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _fetch_token(self) -> str:
        import urllib.request

        request = urllib.request.Request(self.base_url + TOKEN_PATH, method="PUT",
                                         headers={TOKEN_TTL_HEADER: str(TOKEN_TTL_S)})
        with self._opener.open(request, timeout=self.timeout_s) as answer:
            token = answer.read().decode("ascii", "replace").strip()
        self._token, self._token_until = token, time.monotonic() + TOKEN_TTL_S * 0.9
        return token

    def instance_action(self) -> Optional[dict]:
        """The notice document, or None while there is none (404). Raises OSError (URLError)
        when the endpoint cannot be reached, ValueError on a document that is not JSON."""
        import urllib.error
        import urllib.request

        for attempt in (1, 2):
            token = self._token if self._token and time.monotonic() < self._token_until else self._fetch_token()
            request = urllib.request.Request(self.base_url + ACTION_PATH, headers={TOKEN_HEADER: token})
            try:
                with self._opener.open(request, timeout=self.timeout_s) as answer:
                    document = json.loads(answer.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:  # the token expired: a new one, once
                    self._token = None
                    continue
                raise
            if not isinstance(document, dict):
                raise ValueError(f"instance-action is not a JSON object: {document!r}")
            return document
        return None


class SpotWatcher:
    """Polls the metadata for the notice on a daemon thread; ``on_notice`` once, then stops."""

    def __init__(self, base_url: str, on_notice: Callable[[str, str, float], None],
                 poll_s: float = DEFAULT_POLL_S, log: Callable[[str], None] = lambda _m: None) -> None:
        if not poll_s > 0:
            raise ValueError("poll_s must be > 0")
        self.client = MetadataClient(base_url)
        self.on_notice = on_notice
        self.poll_s = poll_s
        self.log = log
        self.notice: Optional[Notice] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spot-watcher", daemon=True)

    def start(self) -> "SpotWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> Optional[Notice]:
        """One look at the metadata: the notice if there is one (None otherwise)."""
        document = self.client.instance_action()
        if document is None:
            return None
        action = str(document.get("action", "terminate"))
        when = str(document.get("time", ""))
        return action, when, seconds_until(when)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
            except (OSError, ValueError) as exc:
                if not failing:
                    self.log(f"spot notice: cannot read {self.client.base_url}{ACTION_PATH}: {exc}; polling on")
                failing = True
                notice = None
            else:
                if failing:
                    self.log(f"spot notice: {self.client.base_url} answers again")
                failing = False
            if notice is not None:
                self.notice = notice
                self.log(f"spot notice: {notice[0]} at {notice[1]} (in {notice[2]:.0f} s)")
                self.on_notice(*notice)
                return
            self._stop.wait(self.poll_s)
