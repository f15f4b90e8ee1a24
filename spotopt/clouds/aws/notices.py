"""AWS preemption notices: the agent's poller of IMDSv2 (see ``spotopt.agent.notices``)."""

from __future__ import annotations

import json

from spotopt.clouds.common.notices import TIMEOUT_S, Notice, NoticeKind, expect, request


class AwsImdsPoller:
    """IMDSv2: a session token first, then the spot instance-action and the rebalance recommendation.

    Per the EC2 user guide ("Use the Instance Metadata Service to access instance metadata",
    IMDSv2): a GET with an expired or invalid token is answered 401, and the client gets a
    new token with the PUT and tries again (once here: a 401 that a fresh token does not cure is
    an error); a 404 on ``spot/instance-action`` or the rebalance recommendation is the normal
    "no notice"; throttling is a 429 and service trouble a 5xx, both errors to retry at the next
    poll, never "no notice". The token PUT itself answers 200, else (a 403 when IMDS is off, a
    hang when the PUT's hop limit is too low for a container) it is an error.
    """

    TOKEN_TTL_S = 21600

    def __init__(self, base_url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token: str | None = None

    def _get(self, path: str) -> tuple[int, bytes]:
        for _ in range(2):
            if self._token is None:
                status, body = request(
                    f"{self.base}/latest/api/token",
                    "PUT",
                    {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)},
                    self.timeout_s,
                )
                expect("aws", "token PUT", status, body, (200,))
                self._token = body.decode()
            status, body = request(
                f"{self.base}{path}",
                headers={"X-aws-ec2-metadata-token": self._token},
                timeout_s=self.timeout_s,
            )
            if status != 401:
                break
            self._token = None  # expired: fetch a new one once
        expect("aws", path, status, body, (200, 404))
        return status, body

    def poll(self) -> Notice | None:
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            data = json.loads(body)
            return Notice("aws", NoticeKind.PREEMPT, f"spot {data.get('action')} at {data.get('time')}")
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            return Notice(
                "aws",
                NoticeKind.REBALANCE,
                f"rebalance recommendation at {json.loads(body).get('noticeTime')}",
            )
        return None
