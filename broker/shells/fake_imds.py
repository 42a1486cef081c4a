"""A fake EC2 instance metadata service on 127.0.0.1, for the dry run and the tests.

It answers what a spot instance's agent asks (``workers/imds.py``) the way IMDSv2 does:

- ``PUT /<instance>/latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1 to
  21600) gives a token; a GET there, or a PUT without the header, is refused (405 / 400);
- ``GET /<instance>/latest/meta-data/spot/instance-action`` wants that token in
  ``X-aws-ec2-metadata-token`` (401 without it or with another one), and answers 404 until
  :meth:`FakeMetadata.post_notice` was called for the instance, then the document
  ``{"action": "terminate", "time": "<ISO 8601 UTC>"}``.

One server serves every instance of a run, each under its own path prefix, so an agent is
pointed at ``base_url(instance_id)``. Every request is recorded in :attr:`requests`
(method, path, whether it carried a valid token). Nothing here listens beyond loopback.
"""

from __future__ import annotations

import json
import secrets
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


def iso_utc(epoch_s: float) -> str:
    """``2026-11-24T13:08:00Z``: the form EC2 writes the notice's time in."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeMetadata:
    """The server, started on a free port of 127.0.0.1 by :meth:`start`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: set[str] = set()
        self._notices: dict[str, dict[str, str]] = {}
        self.requests: list[tuple[str, str, bool]] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> "FakeMetadata":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:  # quiet
                pass

            def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
                fake._answer(self, "PUT")

            def do_GET(self) -> None:  # noqa: N802
                fake._answer(self, "GET")

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-imds", daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    def base_url(self, instance_id: str) -> str:
        """What ``agent.py --spot-metadata`` is given for ``instance_id``."""
        return f"http://{HOST}:{self.port}/{instance_id}"

    def post_notice(self, instance_id: str, terminate_at_epoch_s: float, action: str = "terminate") -> None:
        with self._lock:
            self._notices[instance_id] = {"action": action, "time": iso_utc(terminate_at_epoch_s)}

    def noticed(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self._notices

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeMetadata":
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.close()

    # -- the answers ------------------------------------------------------------------------
    def _answer(self, request: BaseHTTPRequestHandler, method: str) -> None:
        instance, _, rest = request.path.lstrip("/").partition("/")
        rest = "/" + rest
        with self._lock:
            valid = request.headers.get(TOKEN_HEADER) in self._tokens
            self.requests.append((method, request.path, valid))
        if rest == TOKEN_PATH:
            self._token(request, method)
        elif rest == ACTION_PATH:
            if method != "GET":
                self._send(request, 405, "")
            elif not valid:
                self._send(request, 401, "")
            else:
                with self._lock:
                    notice = self._notices.get(instance)
                self._send(request, 200, json.dumps(notice)) if notice else self._send(request, 404, "Not Found")
        else:
            self._send(request, 404, "Not Found")

    def _token(self, request: BaseHTTPRequestHandler, method: str) -> None:
        if method != "PUT":
            self._send(request, 405, "")
            return
        try:
            ttl = int(request.headers.get(TTL_HEADER, ""))
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= 21600:
            self._send(request, 400, "")
            return
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens.add(token)
        self._send(request, 200, token)

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, body: str) -> None:
        data = body.encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json" if body.startswith("{") else "text/plain")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)
