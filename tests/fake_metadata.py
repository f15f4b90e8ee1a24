"""A fake cloud metadata service on 127.0.0.1 serving the three clouds' preemption-notice endpoints
and the instance identities' credentials the start-up script's downloader uses: the AWS role's
temporary keys, a GCP service-account token and an Azure managed-identity token for Storage.

Shapes follow /work/shared/notes/cloud-apis.md §2.6 (AWS IMDSv2: token PUT first, then GETs
carrying it; 404 until a notice), §3.5 (GCP ``instance/preempted`` with ``Metadata-Flavor``) and
§4.6 (Azure Scheduled Events with ``Metadata: true``, the VM's name from
``instance/compute/name``). Requests without the required header or token are refused, as the
real services do. A test can also expire the IMDSv2 token (``expire_token``: the old one is then
answered 401), force a status on a path (``answer``: a 429, a 500, a 400) and make every answer
wait (``hang_s``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

TOKEN = "fake-imds-token"
GCP_TOKEN = "fake-gcp-access-token"
AZURE_TOKEN = "fake-azure-access-token"
AZURE_RESOURCE = "https://storage.azure.com/"
ROLES = "/latest/meta-data/iam/security-credentials/"
ROLE = "spotopt-agent"
ROLE_CREDENTIALS = {  # the instance profile's temporary keys (shape of the IMDS answer)
    "Code": "Success",
    "Type": "AWS-HMAC",
    "AccessKeyId": "ASIAFAKEINSTANCEROLE",
    "SecretAccessKey": "fake-secret-of-the-instance-role",
    "Token": "fake-session-token",
    "Expiration": "2099-01-01T00:00:00Z",
}


class FakeMetadata:
    def __init__(self) -> None:
        self.aws_action: dict[str, str] | None = None
        self.aws_rebalance: dict[str, str] | None = None
        self.gcp_preempted = False
        self.gcp_maintenance = "NONE"
        self.azure_events: list[dict[str, object]] = []
        self.azure_vm_name = "vm"
        self.token = TOKEN
        """The IMDSv2 token the service accepts now (``expire_token`` changes it)."""
        self.answer: dict[str, int] = {}
        """Path (query included) → the status to answer it with instead, for any method."""
        self.hang_s = 0.0
        """Every answer waits this long first (a service that hangs)."""
        self.azure_identity: str | None = None
        """The ``msi_res_id`` the last managed-identity token request named."""
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: bytes = b"") -> None:
                # A client that gave up (a poll's timeout) has nobody left to answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def _forced(self) -> bool:
                """Wait ``hang_s``, then answer a forced status if the test set one."""
                time.sleep(owner.hang_s)
                status = owner.answer.get(self.path)
                if status is not None:
                    self._send(status, f"forced HTTP {status}".encode())
                return status is not None

            def do_PUT(self) -> None:
                owner.requests.append(f"PUT {self.path}")
                if self._forced():
                    return
                if self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    self._send(200, owner.token.encode())
                else:
                    self._send(400)

            def do_GET(self) -> None:
                owner.requests.append(f"GET {self.path}")
                if self._forced():
                    return
                if self.path.startswith("/latest/meta-data/"):
                    if self.headers.get("X-aws-ec2-metadata-token") != owner.token:
                        return self._send(401)
                    if self.path == ROLES:  # a plain-text list of role names, as IMDS answers
                        return self._send(200, ROLE.encode())
                    doc = {
                        "/latest/meta-data/spot/instance-action": owner.aws_action,
                        "/latest/meta-data/events/recommendations/rebalance": owner.aws_rebalance,
                        ROLES + ROLE: ROLE_CREDENTIALS,
                    }.get(self.path)
                    return self._send(404) if doc is None else self._send(200, json.dumps(doc).encode())
                if self.path == "/computeMetadata/v1/instance/service-accounts/default/token":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403)
                    token = {"access_token": GCP_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
                    return self._send(200, json.dumps(token).encode())
                if self.path.startswith("/metadata/identity/oauth2/token?"):
                    query = dict(urllib.parse.parse_qsl(self.path.split("?", 1)[1]))
                    if self.headers.get("Metadata") != "true" or query.get("resource") != AZURE_RESOURCE:
                        return self._send(400)
                    owner.azure_identity = query.get("msi_res_id")
                    token = {"access_token": AZURE_TOKEN, "expires_in": "3599", "token_type": "Bearer"}
                    return self._send(200, json.dumps(token).encode())
                if self.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403)
                    return self._send(200, b"TRUE" if owner.gcp_preempted else b"FALSE")
                if self.path == "/computeMetadata/v1/instance/maintenance-event":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403)
                    return self._send(200, owner.gcp_maintenance.encode())
                if self.path == "/metadata/instance/compute/name?api-version=2021-02-01&format=text":
                    if self.headers.get("Metadata") != "true":
                        return self._send(400)
                    return self._send(200, owner.azure_vm_name.encode())
                if self.path == "/metadata/scheduledevents?api-version=2020-07-01":
                    if self.headers.get("Metadata") != "true":
                        return self._send(400)
                    body = {"DocumentIncarnation": len(owner.azure_events), "Events": owner.azure_events}
                    return self._send(200, json.dumps(body).encode())
                return self._send(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def expire_token(self) -> None:
        """The current IMDSv2 token expires: GETs carrying it are answered 401, a PUT gets a new one."""
        self.token = f"{self.token}-renewed"

    def clear(self) -> None:
        """No notice pending on any cloud (the next instance starts without one)."""
        self.aws_action = None
        self.gcp_preempted = False
        self.gcp_maintenance = "NONE"
        self.azure_events = []

    def notify(self, cloud: str) -> None:
        """Serve a preemption notice the way ``cloud`` does."""
        if cloud == "aws":
            self.aws_action = {"action": "terminate", "time": "2026-11-21T08:24:00Z"}
        elif cloud == "gcp":
            self.gcp_preempted = True
        else:
            self.azure_events = [
                {
                    "EventId": "C1BF",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": ["vm"],
                    "EventStatus": "Scheduled",
                    "NotBefore": "Tue, 09 Aug 2022 17:07:32 GMT",
                    "DurationInSeconds": -1,
                }
            ]


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    fake = FakeMetadata()
    fake._thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
